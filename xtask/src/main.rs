fn main() { eprintln!("no tasks yet"); }
