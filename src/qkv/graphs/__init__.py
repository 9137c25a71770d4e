"""Attribution graphs: the local replacement model of one prompt (its FFNs read as transcoders, an error node per
layer and position), the direct effects between its nodes, pruning, scores, QK attribution and interventions."""
