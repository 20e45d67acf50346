"""Pretraining as a task of the engine (spanlm.train): the recipe, the setup that turns a prepared corpus
and an objective into the loop's TrainingSetup, and the export of a pretraining checkpoint.

``recipe`` (Recipe, load_recipe), ``run`` (pretraining_setup, pretrain), ``export`` (export_checkpoint).
"""
