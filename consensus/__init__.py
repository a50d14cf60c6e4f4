"""fulmar.consensus"""
