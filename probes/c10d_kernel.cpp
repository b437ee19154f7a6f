// meshtop's collective probe, in C++: the fast path of probes/collectives.py.
//
// A boxed kernel for the c10d dispatcher ops (c10d::allreduce_, c10d::send, ...)
// at the BackendSelect key (in every call's key set, inference mode's included),
// as the Python kernel of probes/collectives.py, but without Python on either end
// of an operation:
//   - issuing: read the op's group, buffer bytes, dtype and peer from the boxed
//     arguments, stamp the start, redispatch;
//   - completing: a C++ callback on the work's future stamps the end on the
//     backend's thread, without the GIL. Works without a future (gloo's send,
//     recv and reduce-scatter) end when Python's Work.wait returns (waited()),
//     or a functional collective's wait (_c10d_functional::wait_tensor, hooked
//     at the same key) on one of their outputs, found by its storage.
//   - waiting: Python's Work.wait calls wait_started() first, which stamps the
//     start of the first wait on a work still in flight; at completion the
//     record's waited_ns is the end minus that start (kNone: no wait began).
//   - overlap: an operation issued while others on the same c10d group are in
//     flight marks them and itself overlapped (a scan of in_flight, which
//     holds a handful of operations, under the lock that guards it anyway).
// Finished operations wait in a buffer that Python drains off the training
// thread; in_flight() tells the hang watch what a rank waits on.
//   - drain_lines() writes them as the wire's JSON lines (probes/events.py's
//     CollectiveTiming.to_record, one per line), without Python objects, for
//     every operation whose group Python has named for it (name_group()); the
//     rest come back as tuples for Python to name (a group's first operations).
//   - make_wait() is Work.wait's replacement: the two stamps above around the
//     original, with no Python frame of its own.
// Built on first use by probes/native.py with torch.utils.cpp_extension.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
constexpr size_t kMaxDone = 1'000'000;  // finished, not yet drained: beyond this, counted as dropped
constexpr size_t kMaxWaitable = 10'000;  // in-flight works the wait hook can find (Python's MAX_WAITABLE):
                                         // beyond it, futureless works are not tracked, the rest have no wait
constexpr size_t kMaxErrors = 16;

struct Shape {
  int64_t op;  // index into Python's table of plain op names
  int64_t group_arg;
  int64_t buffer_arg;  // -1: none
  int64_t peer_arg;    // -1: none
  bool times_group;    // S is the group size times the buffer's bytes
};

struct Record {
  int64_t op = 0;
  std::string group;
  int64_t group_size = 0;
  int64_t peer = kNone;
  int64_t nbytes = 0;
  int64_t dtype = kNone;  // c10::ScalarType as an integer
  int64_t step = kNone;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t wait_start_ns = kNone;  // the first Python wait on it that began while it was in flight
  int64_t waited_ns = kNone;      // end_ns - wait_start_ns, set at completion
  bool overlapped = false;        // another operation on its group was in flight with it
  const c10d::Work* work = nullptr;  // its key in State::waitable, or null where that was full
  std::vector<const void*> outputs;  // its first argument's storages (its outputs), while it may end at a wait
};

// An in-flight work the wait hook can find. Works without a future are owned here
// (their end is the wait's return, so they must outlive the Python object); works
// with one are not: their entry goes in their future's callback, while the backend
// still holds them, and dropping the last reference there would free the future
// that is running the callback.
struct Waitable {
  c10::intrusive_ptr<c10d::Work> owned;  // null for works that have a future
  uint64_t id;
};

struct State {
  std::mutex mu;
  std::map<uint64_t, Record> in_flight;  // by id, so the first is the oldest
  std::vector<Record> done;
  std::unordered_map<const c10d::Work*, Waitable> waitable;
  uint64_t next_id = 0;
  int64_t dropped = 0;
  std::vector<std::string> errors;
  std::unordered_set<size_t> without_future;  // Work types whose getFuture throws (gloo's send, recv, ...)
  std::unordered_map<const void*, const c10d::Work*> by_output;  // futureless works in flight, by output storage
};

// What a finished operation's JSON line needs beyond its record, as Python named it.
struct GroupName {
  std::string json;              // the event's group, a quoted JSON string
  std::vector<int64_t> ranks;    // global rank of each group rank
};

struct Names {
  std::mutex mu;
  int64_t rank = 0;
  std::vector<std::string> ops;                      // quoted JSON, by Shape::op
  std::unordered_map<int64_t, std::string> dtypes;   // quoted JSON, by c10::ScalarType
  std::unordered_map<std::string, GroupName> groups;  // by c10d group name
};

// Never freed: a backend thread may complete a work after Python has let go of the module.
State& state() {
  static State* instance = new State();
  return *instance;
}

Names& names() {
  static Names* instance = new Names();
  return *instance;
}

// Written by install() only, between collectives. By the op's schema, whose address the dispatcher keeps
// for the op's life: hashing a pointer, not the op's name, on every operation.
std::unordered_map<const c10::FunctionSchema*, Shape> shapes;
std::atomic<int64_t> current_step{kNone};
std::vector<std::string> typed_ops;  // the ops install() gave a typed kernel (the rest have the boxed one)
std::unique_ptr<torch::Library> library;
std::unique_ptr<torch::Library> functional_library;  // _c10d_functional::wait_tensor's kernel
const c10::DispatchKeySet kBelow(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void note_error(const std::string& message) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.errors.size() < kMaxErrors) s.errors.push_back(message);
}

void add_tensor(const at::Tensor& tensor, Record& record) {
  record.nbytes += static_cast<int64_t>(tensor.numel()) * static_cast<int64_t>(tensor.element_size());
  if (record.dtype == kNone) record.dtype = static_cast<int64_t>(tensor.scalar_type());
}

void add_outputs(const c10::IValue& value, Record& record) {
  if (value.isTensor()) {
    record.outputs.push_back(value.toTensor().storage().unsafeGetStorageImpl());
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) add_outputs(item, record);
  }
}

void add_buffer(const c10::IValue& value, Record& record) {
  if (value.isTensor()) {
    add_tensor(value.toTensor(), record);
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) add_buffer(item, record);
  }
}

Record describe(const Shape& shape, const torch::jit::Stack& stack, size_t first_arg, int64_t start_ns) {
  Record record;
  record.op = shape.op;
  auto group = stack[first_arg + shape.group_arg].toCustomClass<c10d::ProcessGroup>();
  record.group = group->getGroupName();
  record.group_size = group->getSize();
  if (shape.buffer_arg >= 0) add_buffer(stack[first_arg + shape.buffer_arg], record);
  if (shape.times_group) record.nbytes *= record.group_size;
  if (shape.peer_arg >= 0) record.peer = stack[first_arg + shape.peer_arg].toInt();
  add_outputs(stack[first_arg], record);
  record.step = current_step.load(std::memory_order_relaxed);
  record.start_ns = start_ns;
  return record;
}

// Under the lock: move an in-flight record to the finished ones.
void complete_locked(State& s, uint64_t id, int64_t end_ns) {
  auto found = s.in_flight.find(id);
  if (found == s.in_flight.end()) return;
  Record& record = found->second;
  record.end_ns = end_ns;
  // A wait stamped just before the end but let in just after it did not block on this operation.
  if (record.wait_start_ns != kNone && record.wait_start_ns <= end_ns) {
    record.waited_ns = end_ns - record.wait_start_ns;
  }
  if (record.work != nullptr) {
    auto entry = s.waitable.find(record.work);
    if (entry != s.waitable.end() && entry->second.id == id) s.waitable.erase(entry);
    for (const void* output : record.outputs) {
      auto by = s.by_output.find(output);
      if (by != s.by_output.end() && by->second == record.work) s.by_output.erase(by);
    }
  }
  record.outputs.clear();
  if (s.done.size() < kMaxDone) {
    s.done.push_back(std::move(found->second));
  } else {
    ++s.dropped;
  }
  s.in_flight.erase(found);
}

void track(Record record, const c10::intrusive_ptr<c10d::Work>& work) {
  State& s = state();
  const size_t work_type = typeid(*work).hash_code();
  c10::intrusive_ptr<c10::ivalue::Future> future;
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    // "Work::getFuture not implemented": such a work's end is seen at its wait. An exception costs
    // microseconds, so each Work type is asked once.
    if (s.without_future.count(work_type) == 0) {
      try {
        future = work->getFuture();
      } catch (const c10::Error&) {
        s.without_future.insert(work_type);
      }
    }
    const bool room = s.waitable.size() < kMaxWaitable;
    if (!future && !room) return;  // would never be seen to end: cannot be told apart from a hang
    id = s.next_id++;
    for (auto& entry : s.in_flight) {
      Record& other = entry.second;
      if (other.group == record.group) other.overlapped = record.overlapped = true;
    }
    if (room) {
      record.work = work.get();
      s.waitable.insert_or_assign(work.get(), Waitable{future ? nullptr : work, id});
      if (!future) {
        for (const void* output : record.outputs) s.by_output.insert_or_assign(output, work.get());
      }
    }
    if (future) record.outputs.clear();  // ends in its callback: no wait needs to find it
    s.in_flight.emplace(id, std::move(record));
  }
  if (future) {
    future->addCallback(
        [id](c10::ivalue::Future&) {
          const int64_t end_ns = wall_ns();
          State& st = state();
          std::lock_guard<std::mutex> lock(st.mu);
          complete_locked(st, id, end_ns);
        },
        /*uses_future=*/false);
  }
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const int64_t start_ns = wall_ns();
  std::optional<Record> record;
  try {
    const Shape& shape = shapes.at(&op.schema());
    record = describe(shape, *stack, stack->size() - op.schema().arguments().size(), start_ns);
  } catch (const std::exception& error) {  // a probe must never break the job it measures
    note_error(op.schema().name() + ": " + error.what());
  }
  op.redispatchBoxed(keys & kBelow, stack);
  if (!record) return;
  try {
    const c10::IValue& out = stack->back();
    track(std::move(*record), out.isTuple() ? out.toTupleRef().elements().back().toCustomClass<c10d::Work>()
                                            : out.toCustomClass<c10d::Work>());
  } catch (const std::exception& error) {
    note_error(op.schema().name() + ": " + error.what());
  }
}

// ---- typed kernels ------------------------------------------------------------------------------
// The boxed kernel above costs the caller about a microsecond in boxing alone: its typed call is packed
// into a stack of IValues for it, unpacked again for the backend, and the result likewise. The ops most
// collectives go through get a typed kernel instead, with the C++ signature their callers use (the
// dispatcher refuses any other at registration: install() then keeps the boxed kernel for that op).
// The argument positions still come from Python's table.

// Argument ``index`` of a typed call, read as the Shape says (the group, the buffer, the peer).
template <class T>
void take_argument(Record& record, const Shape& shape, int64_t index, const T& value) {
  using V = std::decay_t<T>;
  if constexpr (std::is_same_v<V, c10::intrusive_ptr<c10d::ProcessGroup>>) {
    if (index == shape.group_arg) {
      record.group = value->getGroupName();
      record.group_size = value->getSize();
    }
  } else if constexpr (std::is_same_v<V, at::Tensor>) {
    if (index == shape.buffer_arg) add_tensor(value, record);
    if (index == 0) record.outputs.push_back(value.storage().unsafeGetStorageImpl());
  } else if constexpr (std::is_same_v<V, at::TensorList>) {
    if (index == shape.buffer_arg) {
      for (const at::Tensor& tensor : value) add_tensor(tensor, record);
    }
    if (index == 0) {
      for (const at::Tensor& tensor : value) record.outputs.push_back(tensor.storage().unsafeGetStorageImpl());
    }
  } else if constexpr (std::is_same_v<V, int64_t>) {
    if (index == shape.peer_arg) record.peer = value;
  }
}

template <class Result>
const c10::intrusive_ptr<c10d::Work>& work_of(const Result& out) {
  if constexpr (std::is_same_v<Result, c10::intrusive_ptr<c10d::Work>>) {
    return out;
  } else {
    return std::get<1>(out);
  }
}

// The typed kernel of one op (``Slot`` tells apart ops of one signature, such as send and recv_).
template <int Slot, class Signature>
struct Typed;

template <int Slot, class Result, class... Args>
struct Typed<Slot, Result(Args...)> {
  static inline std::optional<c10::TypedOperatorHandle<Result(Args...)>> handle;
  static inline Shape shape;
  static inline std::string name;

  static Result call(c10::DispatchKeySet keys, Args... args) {
    const int64_t start_ns = wall_ns();
    std::optional<Record> record;
    try {
      record.emplace();
      record->op = shape.op;
      int64_t index = 0;
      (take_argument(*record, shape, index++, args), ...);
      if (shape.times_group) record->nbytes *= record->group_size;
      record->step = current_step.load(std::memory_order_relaxed);
      record->start_ns = start_ns;
    } catch (const std::exception& error) {  // a probe must never break the job it measures
      note_error(name + ": " + error.what());
      record.reset();
    }
    Result out = handle->redispatch(keys & kBelow, std::forward<Args>(args)...);
    if (record) {
      try {
        track(std::move(*record), work_of(out));
      } catch (const std::exception& error) {
        note_error(name + ": " + error.what());
      }
    }
    return out;
  }

  // Register the typed kernel for ``op_name`` (false where this torch's signature is another).
  static bool install(const std::string& op_name, const Shape& op_shape) {
    try {
      handle = c10::Dispatcher::singleton().findSchemaOrThrow(("c10d::" + op_name).c_str(), "")
                   .template typed<Result(Args...)>();
      shape = op_shape;
      name = op_name;
      library->impl(op_name.c_str(), TORCH_FN(call));
      return true;
    } catch (const c10::Error&) {
      handle.reset();
      return false;
    }
  }
};

using Group = const c10::intrusive_ptr<c10d::ProcessGroup>&;
using Reduce = const c10::intrusive_ptr<c10d::ReduceOp>&;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using TensorsAndWork = std::tuple<std::vector<at::Tensor>, WorkPtr>;
using TensorAndWork = std::tuple<at::Tensor, WorkPtr>;

// The signatures of ProcessGroup.hpp's calls, the same in torch 2.11 to 2.15.
const std::unordered_map<std::string, bool (*)(const std::string&, const Shape&)> typed_kernels = {
    {"allreduce_",
     &Typed<0, TensorsAndWork(at::TensorList, Group, Reduce, const std::optional<at::Tensor>&, bool, int64_t)>::install},
    {"broadcast_", &Typed<1, TensorsAndWork(at::TensorList, Group, int64_t, int64_t, bool, int64_t)>::install},
    {"_allgather_base_", &Typed<2, TensorAndWork(at::Tensor&, at::Tensor&, Group, bool, int64_t)>::install},
    {"_reduce_scatter_base_", &Typed<3, TensorAndWork(at::Tensor&, at::Tensor&, Group, Reduce, bool, int64_t)>::install},
    {"allgather_into_tensor_coalesced_", &Typed<4, WorkPtr(at::TensorList, at::TensorList, Group, bool)>::install},
    {"reduce_scatter_tensor_coalesced_",
     &Typed<5, WorkPtr(at::TensorList, at::TensorList, Group, Reduce, bool, int64_t)>::install},
    {"send", &Typed<6, WorkPtr(at::TensorList, Group, int64_t, int64_t)>::install},
    {"recv_", &Typed<7, WorkPtr(at::TensorList, Group, int64_t, int64_t)>::install},
};

using Row = std::tuple<std::string, int64_t, int64_t, int64_t, int64_t, bool>;

void install_wait_tensor();

void install(const std::vector<Row>& table) {
  library.reset();
  shapes.clear();
  library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "c10d", c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
  typed_ops.clear();
  for (const auto& [name, op, group_arg, buffer_arg, peer_arg, times_group] : table) {
    const Shape shape{op, group_arg, buffer_arg, peer_arg, times_group};
    const auto typed = typed_kernels.find(name);
    if (typed != typed_kernels.end() && typed->second(name, shape)) {
      typed_ops.push_back(name);
      continue;
    }
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
    const auto handle = c10::Dispatcher::singleton().findSchema(c10::OperatorName("c10d::" + name, ""));
    if (handle) shapes[&handle->schema()] = Shape{op, group_arg, buffer_arg, peer_arg, times_group};
  }
  install_wait_tensor();
}

// ---- the wire's JSON lines -----------------------------------------------------------------

// ``text`` as a JSON string, quotes included (UTF-8 passes through; JSON allows it).
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[byte >> 4];
      out += hex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void append_int(std::string& out, int64_t value) {
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof(digits), value).ptr;
  out.append(digits, end);
}

void append_int_or_null(std::string& out, int64_t value) {
  if (value == kNone) {
    out += "null";
  } else {
    append_int(out, value);
  }
}

// Under names().mu: ``record`` as its event's JSON line, or false where Python must name it first (its
// group not named here yet, or a peer the group's ranks do not hold).
bool append_line(std::string& out, const Names& n, const Record& r) {
  const auto group = n.groups.find(r.group);
  if (group == n.groups.end() || r.op < 0 || static_cast<size_t>(r.op) >= n.ops.size()) return false;
  const std::vector<int64_t>& ranks = group->second.ranks;
  int64_t peer = r.peer;
  if (peer != kNone && !ranks.empty()) {
    if (peer < 0 || static_cast<size_t>(peer) >= ranks.size()) return false;
    peer = ranks[peer];
  }
  out += "{\"rank\":";
  append_int(out, n.rank);
  out += ",\"step\":";
  append_int_or_null(out, r.step);
  out += ",\"op\":";
  out += n.ops[r.op];
  out += ",\"group\":";
  out += group->second.json;
  out += ",\"group_size\":";
  append_int(out, r.group_size);
  out += ",\"peer\":";
  append_int_or_null(out, peer);
  out += ",\"bytes\":";
  append_int(out, r.nbytes);
  out += ",\"dtype\":";
  const auto dtype = r.dtype == kNone ? n.dtypes.end() : n.dtypes.find(r.dtype);
  out += dtype == n.dtypes.end() ? "null" : dtype->second;
  out += ",\"start_ns\":";
  append_int(out, r.start_ns);
  out += ",\"end_ns\":";
  append_int(out, r.end_ns);
  out += ",\"clock\":\"completion\",\"waited_ns\":";
  append_int_or_null(out, r.waited_ns);
  out += r.overlapped ? ",\"overlapped\":true" : ",\"overlapped\":false";
  out += ",\"kind\":\"collective\"}\n";
  return true;
}

// What the JSON lines need besides the records: this rank, the events' op names (by the install
// table's index) and dtype names (by c10::ScalarType).
void set_names(int64_t rank, const std::vector<std::string>& ops, const std::map<int64_t, std::string>& dtypes) {
  Names& n = names();
  std::lock_guard<std::mutex> lock(n.mu);
  n.rank = rank;
  n.ops.clear();
  for (const std::string& op : ops) n.ops.push_back(json_string(op));
  n.dtypes.clear();
  for (const auto& [code, name] : dtypes) n.dtypes[code] = json_string(name);
}

void name_group(const std::string& c10d_name, const std::string& name, const std::vector<int64_t>& ranks) {
  Names& n = names();
  std::lock_guard<std::mutex> lock(n.mu);
  n.groups.insert_or_assign(c10d_name, GroupName{json_string(name), ranks});
}

void forget_groups() {
  Names& n = names();
  std::lock_guard<std::mutex> lock(n.mu);
  n.groups.clear();
}

py::object none_or(int64_t value) {
  return value == kNone ? py::none() : py::object(py::int_(value));
}

// The layout probes/native_kernel.py's NativeKernel.issued and drain unpack.
py::tuple as_tuple(const Record& r) {
  return py::make_tuple(r.op, r.group, r.group_size, none_or(r.peer), r.nbytes, none_or(r.dtype),
                        none_or(r.step), r.start_ns, none_or(r.waited_ns), r.overlapped, r.end_ns);
}

// Up to ``limit`` finished operations: (JSON lines, their count, the records Python must name as tuples,
// the count dropped, probe errors). The lines are written without the GIL.
py::tuple drain_lines(size_t limit) {
  State& s = state();
  std::vector<Record> taken;
  std::vector<std::string> errors;
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.done.size() <= limit) {
      taken.swap(s.done);
    } else {
      taken.assign(std::make_move_iterator(s.done.begin()), std::make_move_iterator(s.done.begin() + limit));
      s.done.erase(s.done.begin(), s.done.begin() + limit);
    }
    errors.swap(s.errors);
    std::swap(dropped, s.dropped);
  }
  std::string lines;
  int64_t count = 0;
  std::vector<const Record*> unnamed;
  {
    py::gil_scoped_release released;
    lines.reserve(taken.size() * 240);
    Names& n = names();
    std::lock_guard<std::mutex> lock(n.mu);
    for (const Record& record : taken) {
      if (append_line(lines, n, record)) {
        ++count;
      } else {
        unnamed.push_back(&record);
      }
    }
  }
  py::list rest;
  for (const Record* record : unnamed) rest.append(as_tuple(*record));
  return py::make_tuple(py::bytes(lines), count, rest, dropped, errors);
}

// How many operations are in flight, and the oldest (a record tuple whose end is 0), or None.
py::tuple in_flight() {
  State& s = state();
  std::optional<Record> oldest;
  size_t count = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    count = s.in_flight.size();
    if (count) oldest = s.in_flight.begin()->second;
  }
  return py::make_tuple(count, oldest ? py::object(as_tuple(*oldest)) : py::object(py::none()));
}

// Python's Work.wait is about to block: the start of a wait, where the work is in flight and no
// earlier wait on it began.
void wait_started(const c10d::Work* work) {
  const int64_t start_ns = wall_ns();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto found = s.waitable.find(work);
  if (found == s.waitable.end()) return;
  auto record = s.in_flight.find(found->second.id);
  if (record != s.in_flight.end() && record->second.wait_start_ns == kNone) {
    record->second.wait_start_ns = start_ns;
  }
}

// Python's Work.wait returned: the end of a work that has no future (the caller's reference keeps it alive).
void waited(const c10d::Work* work) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto found = s.waitable.find(work);
  if (found == s.waitable.end() || !found->second.owned) return;  // one with a future ends in its callback
  const int64_t end_ns = wall_ns();
  const uint64_t id = found->second.id;
  s.waitable.erase(found);  // drops the entry's reference; the caller's keeps the work alive
  complete_locked(s, id, end_ns);
}

// ---- functional collectives' wait -------------------------------------------------------------
// A functional collective (DTensor's redistributions, sequence parallelism) registers its work with torch
// and waits on it in C++ (_c10d_functional::wait_tensor), never through Python's Work.wait: a work without
// a future (gloo's reduce-scatter) is ended here, found by the storage of the output tensor waited on.

std::optional<c10::TypedOperatorHandle<at::Tensor(const at::Tensor&)>> wait_tensor_op;

at::Tensor wait_tensor(c10::DispatchKeySet keys, const at::Tensor& tensor) {
  const c10d::Work* work = nullptr;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.by_output.empty()) {  // nothing futureless in flight (the common case): no lookup
      auto found = s.by_output.find(tensor.storage().unsafeGetStorageImpl());
      if (found != s.by_output.end()) work = found->second;
    }
  }
  if (work != nullptr) wait_started(work);
  at::Tensor out = wait_tensor_op->redispatch(keys & kBelow, tensor);
  if (work != nullptr) waited(work);  // the entry owns a futureless work: the pointer is still its
  return out;
}

void install_wait_tensor() {
  functional_library.reset();
  wait_tensor_op.reset();
  const auto handle = c10::Dispatcher::singleton().findSchema(c10::OperatorName("_c10d_functional::wait_tensor", ""));
  if (!handle) return;  // a torch without functional collectives: nothing to hook
  try {
    wait_tensor_op = handle->typed<at::Tensor(const at::Tensor&)>();
    functional_library = std::make_unique<torch::Library>(
        torch::Library::IMPL, "_c10d_functional", c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
    functional_library->impl("wait_tensor", TORCH_FN(wait_tensor));
  } catch (const c10::Error& error) {
    note_error(std::string("wait_tensor: ") + error.what());
    functional_library.reset();
    wait_tensor_op.reset();
  }
}

// Work.wait as Python sees it, wrapped: wait_started, the original (torch's binding, which releases the
// GIL), then waited. Written against CPython's vectorcall rather than as a pybind11 function, so a wait
// pays for no argument parsing of the probe's: about half a microsecond instead of one.
// ``original`` is the function's bound object: the Work.wait it wraps.
PyObject* timed_wait(PyObject* original, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const c10d::Work* work = nullptr;
  if (nargs > 0) {
    try {
      work = py::handle(args[0]).cast<c10d::Work*>();  // a borrowed pointer: the caller holds the work
    } catch (const py::cast_error&) {
      // not a Work: the original says what is wrong
    }
  }
  if (work != nullptr) wait_started(work);
  PyObject* result = PyObject_Vectorcall(original, args, static_cast<size_t>(nargs), kwnames);
  if (result != nullptr && work != nullptr) waited(work);
  return result;
}

PyMethodDef timed_wait_def = {"wait", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&timed_wait)),
                              METH_FASTCALL | METH_KEYWORDS, "Work.wait, timed by meshtop's collective probe"};

// The method to put in Work's place of ``original`` (Work.wait as the class holds it).
py::object make_wait(const py::object& original) {
  auto function = py::reinterpret_steal<py::object>(PyCFunction_NewEx(&timed_wait_def, original.ptr(), nullptr));
  if (!function) throw py::error_already_set();
  auto method = py::reinterpret_steal<py::object>(PyInstanceMethod_New(function.ptr()));
  if (!method) throw py::error_already_set();
  return method;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "meshtop's collective probe kernel (see probes/native.py)";
  m.def("install", &install, "Register the kernel for these c10d ops: (name, op, group, buffer, peer, times_group)");
  m.def("uninstall", [] {
    library.reset();
    functional_library.reset();
  });
  m.def("set_step", [](std::optional<int64_t> step) {
    current_step.store(step.value_or(kNone), std::memory_order_relaxed);
  });
  m.def("drain_lines", &drain_lines, py::arg("limit"));
  m.def("typed_ops", [] { return typed_ops; });
  m.def("set_names", &set_names);
  m.def("name_group", &name_group);
  m.def("forget_groups", &forget_groups);
  m.def("make_wait", &make_wait);
  m.def("in_flight", &in_flight);
  m.def("scalar_type", [](const at::Tensor& tensor) { return static_cast<int64_t>(tensor.scalar_type()); });
}
