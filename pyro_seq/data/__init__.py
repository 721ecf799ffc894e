"""pyro_seq.data"""
