"""ONNX in: load, fold, partition at activations, translate operators into expressions.

Translation conventions (the instantiation side relies on them at depth 0):

* Every scope an importer returns has traversal iterators with ``lo = 0`` and
  ``hi`` = the output dimension, in output dimension order, and no ``pad``.
  Rank-0 outputs and zero-sized dimensions are unsupported (passed through).
* Operands are read with :func:`einopt.frontend.operand.read`, which applies
  numpy/ONNX right-aligned broadcasting: a size-1 operand dimension against a
  larger output dimension is indexed by ``0``. Constant operands of one element
  are inlined as ``Const``.
* Element-wise: ``L i: A[i] op B[i]``; ``Sum`` nests ``+``; ``Neg`` is
  ``neg(X[i])``; activations are unary functions (``relu``, ``sigmoid``,
  ``tanh``, ``exp``, ``abs``, ``sqrt``, ``leaky_relu(x, alpha)``); ``PRelu`` is
  ``max(X, 0) + A * min(X, 0)``; ``Clip`` is ``min(max(X, lo), hi)``
  (an absent bound is ONNX's default ``-+FLT_MAX``; an infinite one is left out).
* MatMul: ``L b.., m, n Sum k: A[b.., m, k] * B[b.., k, n]`` (numpy rules for
  1-D operands and batch broadcasting).
* Gemm: the contraction ``S = L m, n Sum k: A[m, k] * B[k, n]`` (transposes
  swap the index order), inline; with ``alpha != 1`` the product is
  ``alpha * (A * B)`` inside the sum; with ``C``: ``L m, n: S[m, n] + C[..]``
  (``beta * C`` when ``beta != 1``).
* Conv: ``S = L n, f, o.. Sum c, k..: X[n, ch, o*s + k*d - pb, ..] * W[f, c, k..]``
  with ``ch = c`` for one group and ``ch = Cg * (f // Fg) + c`` otherwise
  (``Cg``, ``Fg`` = input, output channels per group); with a bias:
  ``L n, f, o..: S[n, f, o..] + B[f]``. Pads are explicit (``auto_pad``
  resolved); the end pads only determine the output size.
* ConvTranspose with stride 1: ``S = L n, f, o.. Sum c, k..: X[n, ch, o + pb - k*d, ..]
  * W[ch, f % Fg, k..]`` (``ch`` as for Conv, ``Fg`` = output channels per
  group). With a stride ``s > 1`` in any spatial dimension, ``X`` is first read
  through the zero-insertion scope ``U = L n, c, i0, p0, i1, p1..: X[n, c, i0, i1..]``
  with every ``p`` in ``[0, 1)``, as ``U[n, ch, (o + pb - k*d) // s, (o + pb - k*d) % s, ..]``
  (reads with a non-zero remainder fall outside ``p``'s range and are 0).
  A ConvTranspose whose form reads such zeros (or border taps) is translated
  only when ``W`` is a constant with finite entries: ONNX Runtime never
  multiplies those zeros by weights, and ``0 * inf`` is NaN.
* Layout: Transpose ``X[permuted iterators]``; Slice/Split ``X[i*step + start]``;
  Pad (constant 0, negative pads crop) ``X[i - pb]``; Concat
  ``A[.., i, ..] + B[.., i - offset, ..] + ..``; Squeeze/Unsqueeze index removed
  dimensions by ``0`` and leave inserted ones unread; Reshape/Flatten read
  ``X[unravel(ravel(i))]`` with ``//`` and ``%``; DepthToSpace (DCR)
  ``X[n, (h % b)*b*C + (w % b)*C + c, h // b, w // b]`` (CRD:
  ``c*b*b + (h % b)*b + w % b``); SpaceToDepth the inverse.
* Gather / GatherElements with a constant integer index tensor whose entries
  (negative ones plus ``dim``) lie in ``[0, dim)`` and equal ``c0 + sum_k c_k*j_k``
  exactly (fitted from the entries, checked on all): Gather
  ``X[a.., c0 + sum_k c_k*j_k, b..]`` (a rank-0 index removes the axis),
  GatherElements ``X[p with p[axis] = c0 + sum_d c_d*p_d]`` (``c_d = 0`` where
  the index is broadcast). Other indices (not constant, not affine, out of
  range) pass through. The read sees through sum-free copy scopes (Reshape,
  Transpose, Pad, ..) while the composed index provably stays in their range,
  with ``//``/``%`` split Euclidean-wise: a band gathered from a flattened
  ``[n*N]`` axis at ``i*N + i + d*j`` reads ``S[.., i, i + d*j]`` when
  ``i + d*j < N``.
* BatchNormalization (inference) is ``X[n, c, ..] * scale[c] + shift[c]`` with
  folded constant ``scale``/``shift`` tensors.
"""
