//! Loom models of mmcid live in `tests/`; this crate only exists so they build in isolation (docs/loom.md).
