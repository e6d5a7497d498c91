"""learners/algorithms"""
