//! Test infrastructure shared by the end-to-end suites.
