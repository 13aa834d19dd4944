"""trialflow.tasks"""
