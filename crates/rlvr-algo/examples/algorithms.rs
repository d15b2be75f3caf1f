//! Prints the preset listing of `rlvr algorithms`.
fn main() {
    rlvr_algo::print_algorithms(&mut std::io::stdout()).expect("stdout");
}
