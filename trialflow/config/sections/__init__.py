"""Each built-in platform's ``trainingService`` section model, one module per platform named as its
service module in ``trialflow.platforms``, and the bases they share. Config layer: pydantic only."""
