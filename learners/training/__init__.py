"""learners/training"""
