"""learners/workers"""
