// One call that copies a match's bindings into a local function (a composite).
//
// The Python outliner builds each Var, call, binding, block, body and function through
// one FFI constructor each, and reads each binding's name, type, operator and attributes
// field by field: about twenty crossings of the FFI per composite, most of its cost.
// Here the fields are read by tvm-ffi reflection and the objects built by calling the
// same registered constructors from C++, so a composite costs one crossing.  No TVM C++
// header is needed.
//
// Only matches whose bindings are all operator calls over leaves are taken (what a
// composite almost always is); anything else (a tuple argument, a projection, a call of
// a function) returns an empty array and the Python outliner builds it.
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/object.h>
#include <tvm/ffi/reflection/accessor.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {
using tvm::ffi::Any;
using tvm::ffi::Array;
using tvm::ffi::Function;
using tvm::ffi::Object;
using tvm::ffi::ObjectRef;
using tvm::ffi::Shape;
using tvm::ffi::String;
using tvm::ffi::reflection::FieldGetter;

int32_t TypeIndex(const char* key) {
  int32_t index;
  TVMFFIByteArray bytes{key, std::char_traits<char>::length(key)};
  TVM_FFI_CHECK_SAFE_CALL(TVMFFITypeKeyToIndex(&bytes, &index));
  return index;
}

struct Api {
  FieldGetter binding_var{"relax.expr.Binding", "var"};
  FieldGetter binding_value{"relax.expr.VarBinding", "value"};
  FieldGetter call_op{"ir.Call", "op"};
  FieldGetter call_args{"ir.Call", "args"};
  FieldGetter call_attrs{"ir.Call", "attrs"};
  FieldGetter call_ty_args{"ir.Call", "ty_args"};
  FieldGetter expr_ty{"ir.Expr", "ty"};
  FieldGetter expr_span{"ir.Expr", "span"};
  FieldGetter var_name{"ir.Var", "name"};
  FieldGetter op_name{"ir.Op", "name"};
  int32_t var_binding = TypeIndex("relax.expr.VarBinding");
  int32_t call = TypeIndex("ir.Call");
  int32_t op = TypeIndex("ir.Op");
  Function new_var = Function::GetGlobalRequired("ir.Var");
  Function new_dataflow_var = Function::GetGlobalRequired("relax.DataflowVar");
  Function new_call = Function::GetGlobalRequired("ir.Call");
  Function new_var_binding = Function::GetGlobalRequired("relax.VarBinding");
  Function new_dataflow_block = Function::GetGlobalRequired("relax.DataflowBlock");
  Function new_seq_expr = Function::GetGlobalRequired("relax.SeqExpr");
  Function new_function = Function::GetGlobalRequired("relax.Function");
  Function update_type = Function::GetGlobalRequired("relax.UpdateType");
};

// The constructors, the type indices and the caches below live as long as the process and
// are never destroyed: destroying tvm-ffi objects (a Python callback among them) after the
// interpreter has shut down corrupts the heap at exit.
const Api& A() {
  static const Api* api = new Api();
  return *api;
}

// ExprKind values of patternkit.ir.walk an argument may have for the call to be copied
// here: a Var, or a leaf that reads none (operator, global, constant, other leaf).
bool IsLeafKind(int64_t kind) { return kind == 1 || (kind >= 5 && kind <= 8); }

// The operators of the match in post-order, each followed by a space, looking through
// its own Vars (each once): what Relay's PartitionedFromPattern is spelled from.
void Names(const Api& a, const Any& expr, const std::unordered_map<const Object*, Any>& values,
           std::unordered_set<const Object*>* seen, std::string* names) {
  const Object* obj = expr.as<Object>();
  if (obj == nullptr) return;
  auto it = values.find(obj);
  if (it != values.end()) {
    if (seen->insert(obj).second) Names(a, it->second, values, seen, names);
    return;
  }
  if (obj->type_index() != a.call) return;  // a leaf: no name
  for (const Any& arg : a.call_args(obj).cast<Array<Any>>()) Names(a, arg, values, seen, names);
  names->append(a.op_name(a.call_op(obj).as<Object>()).cast<String>().c_str());
  names->push_back(' ');
}

// The caches below are shared by every call; tvm-ffi releases the GIL during a call, so
// two Python threads may be here at once.  The lock is never held while Python runs.
std::mutex& cache_mutex = *new std::mutex();

// The leaf types of ``kind_table``, kept while Python passes the same table.
std::shared_ptr<const std::unordered_set<int32_t>> LeavesOf(const Shape& kind_table) {
  static Shape* table = new Shape();
  static auto* leaves = new std::shared_ptr<const std::unordered_set<int32_t>>();
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (*leaves == nullptr || !table->same_as(kind_table)) {
    auto made = std::make_shared<std::unordered_set<int32_t>>();
    for (size_t i = 0; i + 1 < kind_table.size(); i += 2) {
      if (IsLeafKind(kind_table[i + 1])) made->insert(static_cast<int32_t>(kind_table[i]));
    }
    *leaves = made;
    *table = kind_table;
  }
  return *leaves;
}

// ``attrs_of(names)``, asked once per (callback, names): the callback is kept alive with
// its entry, so its address is not reused while the entry stands.
Any AttrsOf(const Function& attrs_of, const std::string& names) {
  static auto* kept = new std::unordered_map<std::string, std::pair<Function, Any>>();
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(attrs_of.get())) + ":" + names;
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = kept->find(key);
    if (it != kept->end()) return it->second.second;
  }
  Any attrs = attrs_of(String(names));  // Python, without the lock
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (kept->size() >= 4096) kept->clear();
  kept->emplace(key, std::make_pair(attrs_of, attrs));
  return attrs;
}
}  // namespace

// The function, or None when the match is not one this builder takes.
//
// ``inputs`` and ``input_types``: the lifted inputs and their types; ``members``: the
// match's VarBindings in program order, the root last; ``prefix``: the parameters' name
// prefix (``FunctionVar_<group>_``); ``attrs_of``: called with the match's operator names
// in post-order (Relax names, each followed by a space), returns the function's
// DictAttrs, which are kept per (attrs_of, names): the composites of one table entry
// mostly share them; ``set_type``: give the body the root's type (the caller does not
// normalise); ``kind_table``: ``(type index, ExprKind)`` pairs
// (patternkit.ir.native_build.kind_table), an argument of another type is not taken.
Any outline_group(Array<Any> inputs, Array<Any> input_types, Array<Any> members,
                  String prefix, Function attrs_of, bool set_type, Shape kind_table) {
  const Api& a = A();
  std::shared_ptr<const std::unordered_set<int32_t>> leaves = LeavesOf(kind_table);
  std::unordered_map<const Object*, Any> values;  // member Var -> its value (for names)
  // Check every binding first: a match this builder does not take builds nothing.
  std::vector<std::pair<Any, Any>> var_value;
  var_value.reserve(members.size());
  for (const Any& binding : members) {
    const Object* b = binding.as<Object>();
    if (b == nullptr || b->type_index() != a.var_binding) return {};
    Any value = a.binding_value(b);
    const Object* call = value.as<Object>();
    if (call == nullptr || call->type_index() != a.call) return {};
    const Object* op = a.call_op(call).as<Object>();
    if (op == nullptr || op->type_index() != a.op) return {};
    for (const Any& arg : a.call_args(call).cast<Array<Any>>()) {
      const Object* leaf = arg.as<Object>();
      if (leaf == nullptr || !leaves->count(leaf->type_index())) return {};
    }
    Any var = a.binding_var(b);
    values[var.as<Object>()] = value;
    var_value.emplace_back(var, value);
  }
  if (var_value.empty()) return {};
  std::unordered_map<const Object*, Any> mapping;  // input or member -> its copy's Var
  Array<Any> params;
  std::string name(prefix.c_str());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Any param = a.new_var(String(name + std::to_string(i)), input_types[i], Any(nullptr));
    params.push_back(param);
    mapping[inputs[i].as<Object>()] = param;
  }
  std::string names;
  std::unordered_set<const Object*> seen;
  Names(a, var_value.back().second, values, &seen, &names);
  Any attrs = AttrsOf(attrs_of, names);
  Array<Any> bindings;
  Any root_var, root_ty;
  for (size_t i = 0; i < var_value.size(); ++i) {
    const Object* var = var_value[i].first.as<Object>();
    const Object* call = var_value[i].second.as<Object>();
    bool root = i + 1 == var_value.size();
    Any ty = a.expr_ty(var);
    Any new_var = (root ? a.new_var : a.new_dataflow_var)(a.var_name(var), ty, Any(nullptr));
    Array<Any> args;
    for (const Any& arg : a.call_args(call).cast<Array<Any>>()) {
      auto it = mapping.find(arg.as<Object>());
      args.push_back(it == mapping.end() ? arg : it->second);
    }
    Any new_call = a.new_call(a.expr_ty(call), a.call_op(call), args, a.call_attrs(call),
                              a.call_ty_args(call), a.expr_span(call));
    bindings.push_back(a.new_var_binding(new_var, new_call, Any(nullptr)));
    mapping[var] = new_var;
    if (root) {
      root_var = new_var;
      root_ty = ty;
    }
  }
  Array<Any> blocks{a.new_dataflow_block(bindings, Any(nullptr))};
  Any body = a.new_seq_expr(blocks, root_var, Any(nullptr));
  if (set_type) a.update_type(body, root_ty);
  Any func = a.new_function(params, body, root_ty, true, attrs, Any(nullptr));
  return func;
}
