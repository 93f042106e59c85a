"""Flow-control policies: fairness between flows, ordering inside a flow, saturation ceilings per band."""
