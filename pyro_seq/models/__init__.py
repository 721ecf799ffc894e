"""pyro_seq.models"""
