"""pyro_seq.distributions"""
