"""The tensor language model's pieces (today: its tokenizer)."""
