//! Interactive chat with a local model (the engine is not built yet).

fn main() {
    eprintln!("llama-hdd: the inference engine is not built yet; the chat arrives with it.");
    std::process::exit(2);
}
