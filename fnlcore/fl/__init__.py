"""The federated-learning engine: the server loop (simulation), local training, client
sampling, input pipelines, run state and settings. It knows no method and no dataset name;
methods (:mod:`fnlcore.methods`) sit on it and the application layer (:mod:`fnlcore.app`)
drives it."""
