"""trialflow.testing.emulators"""
