"""fulmar.archive"""
