//! End-to-end tests of the host core.
