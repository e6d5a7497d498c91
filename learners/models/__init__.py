"""learners/models"""
