"""pyro_seq.nn"""
