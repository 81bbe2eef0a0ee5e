"""A Lightning script WITHOUT orch's callback: ModelCheckpoint writes result/*.ckpt every 5 steps.

On SIGTERM Lightning's own handler stops the loop and the process exits 0 (SIGTERMException is a
SystemExit with no code): a half-trained model that exits like a finished one.
"""

import sys
import time

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.05)
        return self.lin(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


torch.set_num_threads(1)
data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4)
trainer = L.Trainer(max_steps=int(sys.argv[1]), logger=False, enable_progress_bar=False, accelerator="cpu",
                    callbacks=[ModelCheckpoint(dirpath="result", every_n_train_steps=5, save_top_k=-1)])
trainer.fit(Tiny(), data)
