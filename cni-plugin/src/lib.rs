//! The `aws-cni` CNI plugin library: spec types, commands, the pod network plan and its
//! application. Must not: write stdout (only `main` does), keep state on disk, link kube/aws.
