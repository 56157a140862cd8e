//! Generates the gRPC types from proto/fleet.proto with the protoc binary that ships in
//! the protoc-bin-vendored crate (nothing to install).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo::rerun-if-changed=proto/fleet.proto");
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; the variable is read by the generator below.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure().compile_protos(&["proto/fleet.proto"], &["proto"])?;
    Ok(())
}
