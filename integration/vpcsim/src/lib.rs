//! vpcsim: the simulated VPC (EC2 API, IMDSv2, network fabric).
