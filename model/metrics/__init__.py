"""Metrics: the recorder fed by the model, tables built at the end, the Dynamo-style summary."""
