// One call that reads a Relax function's bindings into flat integer arrays.
//
// Fields are read by tvm-ffi reflection on their declaring type (GetFieldInfo does not
// search parents), so no TVM C++ header is needed.  The Python side passes the kind of
// every expression type it knows; on any other type the walk gives up (returns 0 as its
// first element) and the pure-Python reader takes over, so both readers always agree.
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/object.h>
#include <tvm/ffi/reflection/accessor.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace {
using tvm::ffi::Any;
using tvm::ffi::Array;
using tvm::ffi::ObjectRef;
using tvm::ffi::Shape;
using tvm::ffi::reflection::FieldGetter;

// ExprKind values of patternkit.ir.walk.
constexpr int64_t kVar = 1, kCall = 2, kTuple = 3, kGetItem = 4, kOp = 5, kGlobal = 6,
                  kConstant = 7;
// ValueKind values of patternkit.ir.snapshot.model.
constexpr int64_t vOpCall = 0, vGlobalCall = 1, vTuple = 2, vGetItem = 3, vConstant = 4,
                  vVar = 5, vOther = 6;
// Argument codes of patternkit.ir.snapshot.model.
constexpr int64_t aConstant = -1, aLeaf = -2, aTuple = -3, aFree = -4, aParamBase = -5;
constexpr int64_t kNotTensor = -2, kSymbolic = -1;

int32_t TypeIndex(const char* key) {
  int32_t index;
  TVMFFIByteArray bytes{key, std::char_traits<char>::length(key)};
  TVM_FFI_CHECK_SAFE_CALL(TVMFFITypeKeyToIndex(&bytes, &index));
  return index;
}

struct Getters {
  FieldGetter func_params{"relax.expr.Function", "params"};
  FieldGetter func_body{"relax.expr.Function", "body"};
  FieldGetter seq_blocks{"relax.expr.SeqExpr", "blocks"};
  FieldGetter seq_body{"relax.expr.SeqExpr", "body"};
  FieldGetter block_bindings{"relax.expr.BindingBlock", "bindings"};
  FieldGetter binding_var{"relax.expr.Binding", "var"};
  FieldGetter binding_value{"relax.expr.VarBinding", "value"};
  FieldGetter cast_value{"relax.expr.MatchCast", "value"};
  FieldGetter call_op{"ir.Call", "op"};
  FieldGetter call_args{"ir.Call", "args"};
  FieldGetter tuple_fields{"ir.Tuple", "fields"};
  FieldGetter item_tuple{"ir.TupleGetItem", "tuple_value"};
  FieldGetter item_index{"ir.TupleGetItem", "index"};
  FieldGetter expr_ty{"ir.Expr", "ty"};
  FieldGetter tensor_shape{"relax.TensorType", "shape"};
  FieldGetter tensor_dtype{"relax.TensorType", "dtype"};
  FieldGetter tensor_ndim{"relax.TensorType", "ndim"};
  FieldGetter shape_values{"relax.expr.ShapeExpr", "values"};
  FieldGetter int_value{"ir.IntImm", "value"};
  int32_t seq = TypeIndex("relax.expr.SeqExpr");
  int32_t var_binding = TypeIndex("relax.expr.VarBinding");
  int32_t match_cast = TypeIndex("relax.expr.MatchCast");
  int32_t dataflow_block = TypeIndex("relax.expr.DataflowBlock");
  int32_t dataflow_var = TypeIndex("relax.expr.DataflowVar");
  int32_t tensor_type = TypeIndex("relax.TensorType");
  int32_t shape_expr = TypeIndex("relax.expr.ShapeExpr");
  int32_t int_imm = TypeIndex("ir.IntImm");
};

const Getters& G() {
  static Getters getters;
  return getters;
}

struct Walk {
  std::unordered_map<int32_t, int64_t> kinds;
  std::unordered_map<const void*, int64_t> bound;  // Var -> binding index or param code
  std::unordered_map<const void*, int64_t> op_ids, dtype_ids;
  std::vector<int64_t> uses, param_uses, free_at;
  Array<Any> ops, dtypes, free_vars;
  bool unknown = false;

  int64_t Kind(const Any& node) {
    auto it = kinds.find(node.type_index());
    if (it == kinds.end()) {
      unknown = true;
      return 0;
    }
    return it->second;
  }
  void Read(int64_t code) {
    if (code >= 0) {
      uses[code] += 1;
    } else if (code <= aParamBase) {
      param_uses[aParamBase - code] += 1;
    }
  }
  // The code of a leaf or tuple argument read by binding ``at`` (-1: the result);
  // ``nested`` is set when it holds a call.
  int64_t Arg(const Any& node, int64_t at, bool* nested) {
    int64_t kind = Kind(node);
    if (kind == kVar) {
      const void* key = node.as<tvm::ffi::Object>();
      auto it = bound.find(key);
      if (it == bound.end()) {
        free_at.push_back(at);
        free_vars.push_back(node);
        return aFree;
      }
      Read(it->second);
      return it->second;
    }
    if (kind == kConstant) return aConstant;
    if (kind == kTuple) {
      const Getters& g = G();
      for (const Any& field : g.tuple_fields(node.as<tvm::ffi::Object>()).cast<Array<Any>>()) {
        Arg(field, at, nested);
      }
      return aTuple;
    }
    if (kind == kCall) *nested = true;
    return aLeaf;
  }
};
}  // namespace

Array<Any> snapshot_walk(ObjectRef func, Shape kind_table) {
  const Getters& g = G();
  Walk w;
  for (size_t i = 0; i + 1 < kind_table.size(); i += 2) {
    w.kinds[static_cast<int32_t>(kind_table[i])] = kind_table[i + 1];
  }
  Array<Any> params = g.func_params(func.get()).cast<Array<Any>>();
  w.param_uses.assign(params.size(), 0);
  for (size_t p = 0; p < params.size(); ++p) {
    w.bound[params[p].as<tvm::ffi::Object>()] = aParamBase - static_cast<int64_t>(p);
  }
  Any body = g.func_body(func.get());
  if (body.type_index() != g.seq) return Array<Any>{Any(int64_t(0))};
  const tvm::ffi::Object* seq = body.as<tvm::ffi::Object>();
  std::vector<int64_t> var, dataflow_var, block, dataflow, kind, op, item, arg_start, args,
      dtype, rank, dims_start, dims;
  int64_t not_normal = -1;
  int64_t index = 0;
  arg_start.push_back(0);
  dims_start.push_back(0);
  Array<Any> blocks = g.seq_blocks(seq).cast<Array<Any>>();
  size_t total = 0;
  for (const Any& blk : blocks) {
    total += g.block_bindings(blk.as<tvm::ffi::Object>()).cast<Array<Any>>().size();
  }
  w.bound.reserve(total + params.size());
  var.reserve(total);
  dataflow_var.reserve(total);
  block.reserve(total);
  kind.reserve(total);
  op.reserve(total);
  item.reserve(total);
  dtype.reserve(total);
  rank.reserve(total);
  w.uses.reserve(total);
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const tvm::ffi::Object* blk = blocks[bi].as<tvm::ffi::Object>();
    dataflow.push_back(blk->type_index() == g.dataflow_block);
    for (const Any& binding : g.block_bindings(blk).cast<Array<Any>>()) {
      const tvm::ffi::Object* b = binding.as<tvm::ffi::Object>();
      Any v = g.binding_var(b);
      const tvm::ffi::Object* vobj = v.as<tvm::ffi::Object>();
      var.push_back(reinterpret_cast<int64_t>(vobj));
      dataflow_var.push_back(vobj->type_index() == g.dataflow_var ? 1 : 0);
      block.push_back(static_cast<int64_t>(bi));
      w.uses.push_back(0);
      int64_t value_kind = vOther, op_id = -1, item_index = -1;
      bool nested = false;
      if (b->type_index() == g.var_binding) {
        Any value = g.binding_value(b);
        const tvm::ffi::Object* val = value.as<tvm::ffi::Object>();
        int64_t k = w.Kind(value);
        if (k == kCall) {
          Any callee = g.call_op(val);
          int64_t ck = w.Kind(callee);
          if (ck == kOp || ck == kGlobal) {
            value_kind = ck == kOp ? vOpCall : vGlobalCall;
            if (ck == kOp) {
              const void* key = callee.as<tvm::ffi::Object>();
              auto it = w.op_ids.find(key);
              if (it == w.op_ids.end()) {
                it = w.op_ids.emplace(key, static_cast<int64_t>(w.ops.size())).first;
                w.ops.push_back(callee);
              }
              op_id = it->second;
            }
            for (const Any& a : g.call_args(val).cast<Array<Any>>()) {
              args.push_back(w.Arg(a, index, &nested));
            }
          }
        } else if (k == kTuple) {
          value_kind = vTuple;
          for (const Any& a : g.tuple_fields(val).cast<Array<Any>>()) {
            args.push_back(w.Arg(a, index, &nested));
          }
        } else if (k == kGetItem) {
          value_kind = vGetItem;
          item_index = g.item_index(val).cast<int64_t>();
          args.push_back(w.Arg(g.item_tuple(val), index, &nested));
        } else if (k == kConstant) {
          value_kind = vConstant;
        } else if (k == kVar) {
          value_kind = vVar;
          args.push_back(w.Arg(value, index, &nested));
        }
      } else if (b->type_index() == g.match_cast) {
        args.push_back(w.Arg(g.cast_value(b), index, &nested));
      }
      if (w.unknown) return Array<Any>{Any(int64_t(0))};
      if (nested && not_normal < 0) not_normal = index;
      kind.push_back(value_kind);
      op.push_back(op_id);
      item.push_back(item_index);
      arg_start.push_back(static_cast<int64_t>(args.size()));
      // The bound Var's type: dtype and static shape.
      Any ty = g.expr_ty(vobj);
      if (ty.type_index() == g.tensor_type) {
        const tvm::ffi::Object* t = ty.as<tvm::ffi::Object>();
        Any prim = g.tensor_dtype(t);
        int64_t dtype_id = -1;
        if (prim != nullptr) {
          const void* key = prim.as<tvm::ffi::Object>();
          auto it = w.dtype_ids.find(key);
          if (it == w.dtype_ids.end()) {
            it = w.dtype_ids.emplace(key, static_cast<int64_t>(w.dtypes.size())).first;
            w.dtypes.push_back(prim);
          }
          dtype_id = it->second;
        }
        dtype.push_back(dtype_id);
        int64_t ndim = g.tensor_ndim(t).cast<int64_t>();
        rank.push_back(ndim);
        Any shape = g.tensor_shape(t);
        if (shape.type_index() == g.shape_expr) {
          for (const Any& d : g.shape_values(shape.as<tvm::ffi::Object>()).cast<Array<Any>>()) {
            dims.push_back(d.type_index() == g.int_imm
                               ? g.int_value(d.as<tvm::ffi::Object>()).cast<int64_t>()
                               : kSymbolic);
          }
        } else {
          for (int64_t i = 0; i < ndim; ++i) dims.push_back(kSymbolic);
        }
      } else {
        dtype.push_back(-1);
        rank.push_back(kNotTensor);
      }
      dims_start.push_back(static_cast<int64_t>(dims.size()));
      w.bound[vobj] = index;
      ++index;
    }
  }
  bool nested = false;
  Any result = g.seq_body(seq);
  int64_t result_code = w.Arg(result, -1, &nested);
  if (w.unknown) return Array<Any>{Any(int64_t(0))};
  int64_t result_is_call = w.Kind(result) == kCall ? 1 : 0;
  if (nested || result_is_call) result_is_call = 1;
  return Array<Any>{Any(int64_t(1)), Shape(var), Shape(block), Shape(dataflow), Shape(kind),
                    Shape(op), Shape(item), Shape(arg_start), Shape(args), Shape(w.uses),
                    Shape(w.param_uses), Shape(dtype), Shape(rank), Shape(dims_start),
                    Shape(dims), w.ops, w.dtypes, Shape(w.free_at), w.free_vars,
                    Any(result_code), Any(not_normal), Any(result_is_call),
                    Shape(dataflow_var)};
}
