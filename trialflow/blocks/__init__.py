"""trialflow.blocks"""
