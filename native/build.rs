//! Compiles the one piece of C++ (src/acknowledge_list.cpp): pulsar-client's list
//! acknowledgement is a C++ member function, not part of its C API.

fn main() {
    println!("cargo:rerun-if-changed=src/acknowledge_list.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .flag_if_supported("-fvisibility=hidden")
        .file("src/acknowledge_list.cpp")
        .compile("starlight_acknowledge_list");
}
