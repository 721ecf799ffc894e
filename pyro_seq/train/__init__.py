"""pyro_seq.train"""
