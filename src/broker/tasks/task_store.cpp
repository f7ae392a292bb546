// See task_store.hpp.
#include "broker/tasks/task_store.hpp"

#include <stdexcept>

namespace rlbus::broker {

task& task_store::add(task&& t) {
  t.order = ++next_order_;
  auto& added = restore(std::move(t));
  requeue(added);
  return added;
}

task& task_store::restore(task&& t) {
  if (t.order > next_order_) next_order_ = t.order;
  ++owned_[t.owner];
  const auto id = t.id;
  return tasks_.insert_or_assign(id, std::move(t)).first->second;
}

void task_store::erase(std::string_view id) {
  const auto it = tasks_.find(id);
  if (it == tasks_.end()) return;
  queue_.erase(it->second.order);
  if (const auto o = owned_.find(it->second.owner); o != owned_.end() && --o->second == 0)
    owned_.erase(o);
  tasks_.erase(it);
}

task* task_store::find(std::string_view id) {
  const auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : &it->second;
}

const task* task_store::find(std::string_view id) const {
  const auto it = tasks_.find(id);
  return it == tasks_.end() ? nullptr : &it->second;
}

task& task_store::at(std::string_view id) {
  if (auto* t = find(id)) return *t;
  throw std::out_of_range("no live task with that id");
}

const task& task_store::at(std::string_view id) const {
  if (const auto* t = find(id)) return *t;
  throw std::out_of_range("no live task with that id");
}

std::size_t task_store::owned_by(const std::string& id) const {
  const auto it = owned_.find(id);
  return it == owned_.end() ? 0 : it->second;
}

}  // namespace rlbus::broker
