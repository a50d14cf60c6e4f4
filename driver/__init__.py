"""fulmar.driver"""
