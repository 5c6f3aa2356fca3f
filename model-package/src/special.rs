//! Special token ids. The tokenizer trainer reserves these first, in this order, so the ids
//! are the same in every tokenizer this project makes; the server checks them at load.

pub const PAD: u32 = 0;
pub const BOS: u32 = 1;
pub const EOS: u32 = 2;
pub const UNK: u32 = 3;

/// Surface forms, indexed by id.
pub const TOKENS: [&str; 4] = ["<pad>", "<s>", "</s>", "<unk>"];

pub const PAD_TOKEN: &str = TOKENS[PAD as usize];
pub const BOS_TOKEN: &str = TOKENS[BOS as usize];
pub const EOS_TOKEN: &str = TOKENS[EOS as usize];
pub const UNK_TOKEN: &str = TOKENS[UNK as usize];
