//! Control plane: connection arrival, negotiation decisions, Storage QoS flow table (issues 4, 5).
