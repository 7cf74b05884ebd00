"""Node-group composition: stages over node groups of each island (several stages per
island, each on some of its nodes), exact by DP with bounds, checked by brute force.

Takes a stage table per (island, node count, position); hands on a CompositionResult.
"""
