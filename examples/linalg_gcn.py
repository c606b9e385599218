"""A two-layer graph convolutional network (Kipf & Welling) with asd.linalg (seed 004, 4.4).

The graph is generated: a stochastic block model with 6 classes (like CiteSeer's 6), sparse
noisy bag-of-words-like node features, and 20 labelled nodes per class.  Each layer computes
    X' = A_hat X Theta,   A_hat = D^{-1/2} (A + I) D^{-1/2}  (sparse CSR),
right to left as sparse-dense products.  With ``--learn-edges`` the stored values of A_hat are
learned too (edge weights, initialised to the normalised adjacency, a smaller learning rate):
their gradient lives on the graph's edges only.

    python examples/linalg_gcn.py [--learn-edges]
"""

import warnings

import torch
import torch.nn.functional as F

import asd.linalg as al

warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")


def make_graph(n=1200, classes=6, p_in=0.02, p_out=0.0005, feats=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(classes, (n,), generator=g)
    same = y[:, None] == y[None, :]
    prob = torch.where(same, torch.tensor(p_in), torch.tensor(p_out))
    upper = torch.triu(torch.rand(n, n, generator=g) < prob, 1)
    adj = (upper | upper.t()).float() + torch.eye(n)              # A + I
    dinv = adj.sum(1).rsqrt()
    a_hat = (dinv[:, None] * adj * dinv[None, :]).to_sparse_csr()
    # each class prefers a block of feature words; features are sparse and noisy
    words = torch.rand(n, feats, generator=g) < 0.01
    block = feats // classes
    pref = torch.zeros(n, feats, dtype=torch.bool)
    for c in range(classes):
        pref[y == c, c * block:(c + 1) * block] = True
    words |= pref & (torch.rand(n, feats, generator=g) < 0.05)
    X = words.float()
    X = X / X.sum(1, keepdim=True).clamp(min=1)
    train = torch.zeros(n, dtype=torch.bool)
    for c in range(classes):
        train[(y == c).nonzero()[:20, 0]] = True
    return a_hat, X, y, train


class GCN(torch.nn.Module):
    def __init__(self, a_hat, n_in, n_hidden, n_out, p_drop=0.5):
        super().__init__()
        self.crow, self.col = a_hat.crow_indices(), a_hat.col_indices()
        self.shape = a_hat.shape
        self.edge = torch.nn.Parameter(a_hat.values().clone())
        self.lin1 = torch.nn.Linear(n_in, n_hidden)
        self.lin2 = torch.nn.Linear(n_hidden, n_out)
        self.p = p_drop

    def forward(self, X):
        A = torch.sparse_csr_tensor(self.crow, self.col, self.edge, self.shape)
        h = F.dropout(X, self.p, self.training)
        h = F.relu(al.matmul(A, self.lin1(h)))
        h = F.dropout(h, self.p, self.training)
        return al.matmul(A, self.lin2(h))


def main(epochs: int = 200, learn_edges: bool = False) -> list[float]:
    torch.manual_seed(0)
    a_hat, X, y, train = make_graph()
    print(f"graph: {a_hat.shape[0]} nodes, {a_hat.values().numel()} stored entries (with self loops)")
    model = GCN(a_hat, X.shape[1], 16, int(y.max()) + 1)
    model.edge.requires_grad_(learn_edges)
    groups = [dict(params=list(model.lin1.parameters()) + list(model.lin2.parameters()))]
    if learn_edges:
        groups.append(dict(params=[model.edge], lr=1e-3, weight_decay=0.0))
    opt = torch.optim.Adam(groups, lr=0.01, weight_decay=5e-4)
    losses = []
    for epoch in range(epochs):
        model.train()
        loss = F.cross_entropy(model(X)[train], y[train])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if epoch % 25 == 0 or epoch == epochs - 1:
            model.eval()
            with torch.no_grad():
                acc = (model(X).argmax(1)[~train] == y[~train]).float().mean().item()
            print(f"epoch {epoch:4d}  loss {loss.item():.4f}  test accuracy {acc:.3f}")
    return losses


if __name__ == "__main__":
    import sys

    losses = main(learn_edges="--learn-edges" in sys.argv)
    assert losses[-1] < losses[0]
