//! What the vpcsim suites that drive the simulator through aws-sdk-ec2 share: the project's AWS
//! HTTP client (hyper + rustls on ring) and the SDK configuration aimed at a local endpoint
//! (us-west-2, static credentials). Each suite adds its own retry, timeout or interceptor.
//! Must not start servers or hold state.
#![allow(dead_code)]

use std::net::SocketAddr;

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_smithy_http_client::tls;

/// hyper + rustls (ring), as ipamd's EC2 client.
pub fn http_client() -> aws_sdk_ec2::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// An EC2 SDK configuration for `http://<addr>` with access key `access_key`.
pub fn ec2_config(addr: SocketAddr, access_key: &str) -> aws_sdk_ec2::config::Builder {
    aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-west-2"))
        .credentials_provider(Credentials::new(access_key, "secret", None, None, "static"))
        .endpoint_url(format!("http://{addr}"))
        .http_client(http_client())
}
