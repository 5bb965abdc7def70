" Vim syntax file
" Language:   tensorlang schedules (*.tsched)
" Mirrors the VS Code TextMate grammar in editors/vscode/syntaxes/.

if exists('b:current_syntax')
  finish
endif

syn keyword tschedTodo contained TODO FIXME XXX NOTE
syn match   tschedComment "#.*$" contains=tschedTodo,@Spell

" Declarations: `target NAME`, `op NAME`, `schedule NAME on TARGET`.
syn keyword tschedDeclaration op schedule nextgroup=tschedOpName skipwhite
syn keyword tschedDeclaration target on nextgroup=tschedTargetName skipwhite
syn match   tschedOpName "\h\w*" contained
syn match   tschedTargetName "\h\w*" contained
syn keyword tschedTargetKind llvm cuda
syn match   tschedDecorator "@\s*\h\w*"

syn keyword tschedConditional if else
syn keyword tschedLogical and or not
syn keyword tschedType f16 bf16 f32 f64 i8 i16 i32 i64 u8 bool

" Later matches win at the same start, so the general patterns come first.
syn match   tschedTensor "\<\h\w*\ze\s*\["
syn match   tschedTensor "\<\h\w*\ze\s*:"
syn match   tschedLoopRef "\<\h\w*\.\h\w*\>"
syn match   tschedBinding "^\s*\zs\h\w*\%(\s*,\s*\h\w*\)*\ze\s*=\%(=\)\@!"
syn match   tschedMath "\<\%(exp\|log\|sqrt\|rsqrt\|tanh\|sigmoid\|erf\|abs\|max\|min\|relu\)\ze\s*("
syn match   tschedPrimitive "\<\%(split\|fuse\|reorder\|parallel\|vectorize\|unroll\|bind\|cache_read\|cache_write\|compute_at\|reverse_compute_at\|compute_inline\|reverse_compute_inline\|decompose_reduction\|annotate\|storage_align\|set_scope\|rfactor\)\ze\s*("
syn match   tschedThreadAxis "\<\%(blockIdx\|threadIdx\|vthread\)\.[xyz]\>"
syn match   tschedScope "\<\%(shared\.dyn\|global\|shared\|local\|warp\)\>\%([.]\)\@!"

syn match   tschedNumber "\<\d\+\%(\.\d*\)\=\%([eE][+-]\=\d\+\)\=\>"
syn match   tschedNumber "\.\d\+\%([eE][+-]\=\d\+\)\=\>"
syn region  tschedString start=+"+ skip=+\\.+ end=+"+ oneline

syn match   tschedAssign "\%(+\|\<max\|\<min\)\==\%(=\)\@!"
syn match   tschedComparison "[<>!=]=\|[<>]"
syn match   tschedArrow "->"

hi def link tschedTodo        Todo
hi def link tschedComment     Comment
hi def link tschedDeclaration Keyword
hi def link tschedOpName      Function
hi def link tschedTargetName  Typedef
hi def link tschedTargetKind  Structure
hi def link tschedDecorator   PreProc
hi def link tschedConditional Conditional
hi def link tschedLogical     Operator
hi def link tschedType        Type
hi def link tschedTensor      Identifier
hi def link tschedLoopRef     Identifier
hi def link tschedBinding     Identifier
hi def link tschedMath        Function
hi def link tschedPrimitive   Statement
hi def link tschedThreadAxis  Constant
hi def link tschedScope       Constant
hi def link tschedNumber      Number
hi def link tschedString      String
hi def link tschedAssign      Operator
hi def link tschedComparison  Operator
hi def link tschedArrow       Operator

let b:current_syntax = 'tsched'
