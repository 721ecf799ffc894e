"""pyro_seq.infer"""
