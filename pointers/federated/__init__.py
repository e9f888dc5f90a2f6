"""Federated learning on pointers, an application layer that ``import pointers`` loads on
first use: datasets and loaders spread over workers (datasets) and federated averaging
(fedavg)."""
