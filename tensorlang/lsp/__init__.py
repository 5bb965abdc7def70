"""The tensorlang language server (`tensorlang lsp`).

Layout:
- `text`: positions (1-based spans <-> LSP positions in any encoding), a small lexer;
- `incremental`: the core parser applied chunk by chunk, re-parsing only the chunks an edit touched;
- `analysis`: one document version: its checked model and an index of names (definitions, references,
  token kinds), and the cursor context for completion. No pygls, no TVM;
- `features`: the LSP answers built from an analysis (lsprotocol types);
- `tvm_worker`: the TVM side (legality, loop names after statements, generated schedules, lowering,
  measuring), the program of the worker processes (`python -m tensorlang.lsp.tvm_worker`);
- `worker_queue`: the server's side of those processes: a small priority queue of jobs per worker;
- `server`: the pygls server, started by `tensorlang lsp` (`main()`).

Only this package imports pygls/lsprotocol; everything it shows comes from the core (`tensorlang.api`,
`analysis`, `lower`, `baselines`), like the CLI. The server process never imports TVM.
"""
