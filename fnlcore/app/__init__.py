"""The application layer: what a workflow job does (expand tables, run a training job,
train an annotator, write a table), above the engine (:mod:`fnlcore.fl`) and the registries."""
