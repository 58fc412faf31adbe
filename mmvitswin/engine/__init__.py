"""Training-time pieces registered into mmvitswin's (and the hosts') registries."""
