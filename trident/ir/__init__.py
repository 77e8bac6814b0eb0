"""The IR: the data that passes between the stages. Operands, guards, the plan's steps, Triton
launches and the specialization; no stage logic lives here."""
