// meshtop's collective probe, in C++: the fast path of probes/collectives.py.
//
// A boxed kernel for the c10d dispatcher ops (c10d::allreduce_, c10d::send, ...)
// at the ADInplaceOrView key, as the Python kernel of probes/collectives.py, but
// without Python on either end of an operation:
//   - issuing: read the op's group, buffer bytes, dtype and peer from the boxed
//     arguments, stamp the start, redispatch;
//   - completing: a C++ callback on the work's future stamps the end on the
//     backend's thread, without the GIL. Works without a future (gloo's send,
//     recv and reduce-scatter) end when Python's Work.wait returns (waited()).
//   - waiting: Python's Work.wait calls wait_started() first, which stamps the
//     start of the first wait on a work still in flight; at completion the
//     record's waited_ns is the end minus that start (kNone: no wait began).
//   - overlap: an operation issued while others on the same c10d group are in
//     flight marks them and itself overlapped (a scan of in_flight, which
//     holds a handful of operations, under the lock that guards it anyway).
// Finished operations wait in a buffer that Python drains off the training
// thread (drain()); in_flight() tells the hang watch what a rank waits on.
// Built on first use by probes/native.py with torch.utils.cpp_extension.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
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
};

// Never freed: a backend thread may complete a work after Python has let go of the module.
State& state() {
  static State* instance = new State();
  return *instance;
}

std::unordered_map<std::string, Shape> shapes;  // written by install() only, between collectives
std::atomic<int64_t> current_step{kNone};
std::unique_ptr<torch::Library> library;

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

void add_buffer(const c10::IValue& value, Record& record) {
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    record.nbytes += static_cast<int64_t>(tensor.numel()) * static_cast<int64_t>(tensor.element_size());
    if (record.dtype == kNone) record.dtype = static_cast<int64_t>(tensor.scalar_type());
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
  }
  if (s.done.size() < kMaxDone) {
    s.done.push_back(std::move(found->second));
  } else {
    ++s.dropped;
  }
  s.in_flight.erase(found);
}

void track(Record record, const c10::IValue& out) {
  c10::intrusive_ptr<c10d::Work> work = out.isTuple()
      ? out.toTupleRef().elements().back().toCustomClass<c10d::Work>()
      : out.toCustomClass<c10d::Work>();
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work->getFuture();
  } catch (const c10::Error&) {
    // "Work::getFuture not implemented": this work's end is seen at its wait.
  }
  State& s = state();
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
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
    }
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
    const Shape& shape = shapes.at(op.schema().name());
    record = describe(shape, *stack, stack->size() - op.schema().arguments().size(), start_ns);
  } catch (const std::exception& error) {  // a probe must never break the job it measures
    note_error(op.schema().name() + ": " + error.what());
  }
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  if (!record) return;
  try {
    track(std::move(*record), stack->back());
  } catch (const std::exception& error) {
    note_error(op.schema().name() + ": " + error.what());
  }
}

using Row = std::tuple<std::string, int64_t, int64_t, int64_t, int64_t, bool>;

void install(const std::vector<Row>& table) {
  library.reset();
  shapes.clear();
  library = std::make_unique<torch::Library>(
      torch::Library::IMPL, "c10d", c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
  for (const auto& [name, op, group_arg, buffer_arg, peer_arg, times_group] : table) {
    shapes["c10d::" + name] = Shape{op, group_arg, buffer_arg, peer_arg, times_group};
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
  }
}

py::object none_or(int64_t value) {
  return value == kNone ? py::none() : py::object(py::int_(value));
}

// The layout probes/collectives.py's _native_issued and flush unpack.
py::tuple as_tuple(const Record& r) {
  return py::make_tuple(r.op, r.group, r.group_size, none_or(r.peer), r.nbytes, none_or(r.dtype),
                        none_or(r.step), r.start_ns, none_or(r.waited_ns), r.overlapped, r.end_ns);
}

// Finished operations since the last call, the count dropped, and probe errors.
py::tuple drain() {
  State& s = state();
  std::vector<Record> taken;
  std::vector<std::string> errors;
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    taken.swap(s.done);
    errors.swap(s.errors);
    std::swap(dropped, s.dropped);
  }
  py::list records;
  for (const Record& record : taken) records.append(as_tuple(record));
  return py::make_tuple(records, dropped, errors);
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
void wait_started(const c10::intrusive_ptr<c10d::Work>& work) {
  const int64_t start_ns = wall_ns();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto found = s.waitable.find(work.get());
  if (found == s.waitable.end()) return;
  auto record = s.in_flight.find(found->second.id);
  if (record != s.in_flight.end() && record->second.wait_start_ns == kNone) {
    record->second.wait_start_ns = start_ns;
  }
}

// Python's Work.wait returned: the end of a work that has no future.
void waited(const c10::intrusive_ptr<c10d::Work>& work) {
  const int64_t end_ns = wall_ns();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto found = s.waitable.find(work.get());
  if (found == s.waitable.end() || !found->second.owned) return;  // one with a future ends in its callback
  const uint64_t id = found->second.id;
  s.waitable.erase(found);  // drops the entry's reference; the caller's keeps the work alive
  complete_locked(s, id, end_ns);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "meshtop's collective probe kernel (see probes/native.py)";
  m.def("install", &install, "Register the kernel for these c10d ops: (name, op, group, buffer, peer, times_group)");
  m.def("uninstall", [] {
    library.reset();
  });
  m.def("set_step", [](std::optional<int64_t> step) {
    current_step.store(step.value_or(kNone), std::memory_order_relaxed);
  });
  m.def("drain", &drain);
  m.def("in_flight", &in_flight);
  m.def("wait_started", &wait_started);
  m.def("waited", &waited);
  m.def("scalar_type", [](const at::Tensor& tensor) { return static_cast<int64_t>(tensor.scalar_type()); });
}
