"""fulmar.service"""
