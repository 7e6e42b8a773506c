//! Byte-level BPE (work in progress).
