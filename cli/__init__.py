"""fulmar.cli"""
