"""trialflow.testing"""
