//! Compiles `rpc.proto` with protox (a pure-Rust protobuf compiler), so a fresh machine needs
//! no system `protoc`. Client and server stubs are both generated; the `client`/`server`
//! features decide which are compiled (see `src/lib.rs`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=rpc.proto");
    let fds = protox::compile(["rpc.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .client_mod_attribute("rpc", "#[cfg(feature = \"client\")]")
        .server_mod_attribute("rpc", "#[cfg(feature = \"server\")]")
        .compile_fds(fds)?;
    Ok(())
}
