// CUDA graphs of the MoE halves (gpu_forward.hpp, graph_workspace): with the fast kernel set, a
// forward call of graph_min_rows (by default 1) to 64 rows (decode), or of the sliding window's
// rows (which the truncated decoder layers keep at prefill and a prefix hit replays), runs each
// layer's MoE half (HCPost and HCMix of the FFN sublayer, router, experts, HCPost) as one graph
// per (rows, layer), over buffers that live as long as the model, so the captured addresses
// stay valid.
// The half depends on the row count only, so decode and prefill calls of one count share its
// graphs. A decode step's layers that neither compress nor index also run their attention half
// in the graph (one graph a layer, key (rows, -1 - layer)): the positions, page tables and top-k
// they read are the workspace's, rewritten in place before the first layer; when a table
// outgrows its array the new array's generation has those graphs captured again.
// $CEDAR_GPU_LAYER_GRAPHS=0 keeps the attention halves eager. The forward call's thread.
#ifdef CEDAR_HAVE_CUDA

#include <algorithm>

#include "kernels/cuda/fast/fast_ops.hpp"
#include "kernels/cuda_model/gpu_forward.hpp"

namespace cedar {

graph_workspace* gpu_model::impl::graph_workspace_for(int rows, const forward_stats* stats) const {
  // The experts above the gemv row count wait for the host (per-expert counts): not capturable.
  // Each row count keeps its own workspace and graphs for the model's life, so the graphed
  // counts are those of decode batches from graph_min_rows (by default 1) to 64 (0.26 GB of
  // workspaces for bench-40L-E64 if every count occurs) and the window's (16 MB).
  constexpr int max_graph_rows = 64;
  if (!graphs_enabled || profile.on() || stats != nullptr || rows == 0 ||
      ((rows < graph_min_rows || rows > max_graph_rows) && rows != args.sliding_window) ||
      rows > cuda::fast::tuning_now().expert_gemv_max_rows)
    return nullptr;
  auto [it, added] = workspaces.try_emplace(rows);
  if (added) {
    const std::size_t n = std::size_t(rows), hc = args.hc_mult, D = args.hidden_size;
    graph_workspace& w = it->second;
    w.X = dvec<float>(n * hc * D), w.pre = dvec<float>(n * hc), w.a_pre = dvec<float>(n * hc);
    w.post = dvec<float>(n * hc), w.comb = dvec<float>(n * hc * hc), w.x = dvec<float>(n * D), w.f = dvec<float>(n * D);
  }
  return &it->second;
}

// The first call of a key runs eagerly, so that the ops' one-time set-up (device copies of
// weight tables) is not captured; the second captures, later ones replay.
void gpu_model::impl::run_graphed(std::pair<int, int> key, const std::function<void()>& enqueue,
                                  int generation) const {
  graph_entry& g = graphs[key];
  if (g.exec != nullptr && g.generation != generation) {
    cuda::graph_destroy(g.exec);
    g.exec = nullptr;
  }
  if (g.exec == nullptr && g.eager_runs++ == 0) return enqueue();
  if (g.exec == nullptr) {
    cuda::graph_capture_begin();
    enqueue();
    if (cuda::fast::side_pending()) cuda::fast::side_wait();  // a branch the ops left open (hc_boundary's Sinkhorn)
    g.exec = cuda::graph_capture_end();
    g.generation = generation;
  }
  cuda::graph_launch(g.exec);
}

bool gpu_model::impl::whole_layers_graphable(const gbatch& b) const {
  if (b.ws == nullptr || !layer_graphs_enabled || sharded() || !fast_attention()) return false;
  return std::all_of(b.items.begin(), b.items.end(), [](const gitem& it) {
    return it.num_rows == 1 && !it.item->replay && it.truncated_rows() == 0;
  });
}

bool gpu_model::impl::layer_graphed(int l, const gbatch& b) const {
  const layer_info& li = args.layers[l];
  return b.whole_layers && !li.is_kv_source && !li.is_index_source;
}

}  // namespace cedar

#endif  // CEDAR_HAVE_CUDA
