//! Embedded software RDMA provider (being written).
