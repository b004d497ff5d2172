//! Compiles the .proto files with protox (pure Rust, so no `protoc` is needed) and generates the
//! prost messages and tonic clients and servers.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files =
        ["proto/csi/v1/csi.proto", "proto/pluginregistration/api.proto", "proto/secretsstore/v1alpha1/service.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
