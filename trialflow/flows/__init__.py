"""trialflow.flows"""
